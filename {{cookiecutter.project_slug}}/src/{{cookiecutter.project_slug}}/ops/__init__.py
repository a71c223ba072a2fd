"""Operations around training: plan, check, pack, export.

The resource plan (`plan`), the environment check (`doctor`), the cluster-site check
(`sitecheck`), packing small runs onto one GPU (`packing`) and the export of a run's weights
(`export`).

May import: the seam, `engine`, `data`, `observe`. Never: `experiments`, `tasks`.
"""
