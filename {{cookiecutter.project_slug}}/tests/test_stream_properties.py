"""Streams, property by property: any stop, any buffer, any tar layout and cut (Hypothesis)."""

import io
import os
import tarfile
from itertools import islice
from pathlib import Path

import pytest
import torch

from conftest import DEV_ONLY, pkg

pytest.importorskip("hypothesis", reason=DEV_ONLY)
from hypothesis import given, settings
from hypothesis import strategies as st

from toy_tasks.streams import Counted, Generated

streams = pkg("data.streams")
turns = pkg("engine.loop.stream_batches").in_turns


def feed(stream, *, rank: int = 0, world: int = 1, resume=None) -> object:
    part = streams.StreamPart(rank, world, 0, 1)
    return streams.StreamFeed(
        stream, part, 0, 4, 0, torch.utils.data.default_collate, "test", resume=resume or {}
    )


def batches_of(pairs) -> list[torch.Tensor]:
    return [batch[0] for batch, tag in pairs if not tag.done]


@settings(max_examples=25, deadline=None)
@given(
    world=st.integers(1, 3),
    stop=st.integers(0, 12),
    kind=st.sampled_from(["counted", "generated", "buffered"]),
    buffer=st.integers(1, 20),
)
def test_a_feed_resumed_from_any_tag_goes_on_as_if_never_stopped(
    world: int, stop: int, kind: str, buffer: int
) -> None:
    """Counting and skipping (no state) and a saved state (with a buffer) give the same rest."""

    def stream() -> object:
        return {
            "counted": lambda: Counted(97),
            "generated": lambda: Generated(97, split=False),
            "buffered": lambda: streams.ShuffleBuffer(Counted(97), buffer, seed=3),
        }[kind]()

    for rank in range(world):
        whole = list(feed(stream(), rank=rank, world=world))
        cut = list(islice(feed(stream(), rank=rank, world=world), stop))
        if not cut or cut[-1][1].done:
            continue
        rest = feed(stream(), rank=rank, world=world, resume={0: cut[-1][1].saved()})
        expected, got = batches_of(whole[len(cut) :]), batches_of(rest)
        assert len(expected) == len(got)
        for a, b in zip(expected, got, strict=True):
            assert torch.equal(a, b)


@settings(max_examples=25, deadline=None)
@given(size=st.integers(1, 40), stop=st.integers(0, 60), n=st.integers(0, 50))
def test_a_shuffle_buffer_resumes_with_its_contents(size: int, stop: int, n: int) -> None:
    whole = list(streams.ShuffleBuffer(range(n), size, seed=1))
    assert sorted(whole) == list(range(n))  # every sample once
    first = streams.ShuffleBuffer(range(n), size, seed=1)
    head = list(islice(iter(first), stop))
    again = streams.ShuffleBuffer(range(n), size, seed=1)
    again.load_state_dict(first.state_dict())
    assert head + list(again) == whole


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(0, 6), min_size=1, max_size=4), stop=st.integers(0, 20))
def test_turns_resume_from_the_next_worker(lengths: list[int], stop: int) -> None:
    """Workers of unequal lengths: a pass begun at the saved next worker goes on in order."""
    tag = pkg("data.streams").Tag

    def loader(skips: dict[int, int]) -> list:
        # What a DataLoader delivers: worker 0, 1, ... in turn, the done ones dropping out.
        queues = [
            [(f"{w}:{i}", tag(w, i + 1, i + 1)) for i in range(skips.get(w, 0), n)]
            + [(None, tag(w, n, n, done=True))]
            for w, n in enumerate(lengths)
        ]
        out = []
        while any(queues):
            out += [q.pop(0) for q in queues if q]
        return out

    whole = list(turns(iter(loader({})), len(lengths), 0))
    assert sorted(b for b, _ in whole) == sorted(
        f"{w}:{i}" for w, n in enumerate(lengths) for i in range(n)
    )
    head = whole[:stop]
    done = {t.worker: t.pulled for _, t in head}
    following = (head[-1][1].worker + 1) % len(lengths) if head else 0
    rest = list(turns(iter(loader(done)), len(lengths), following))
    assert [b for b, _ in head + rest] == [b for b, _ in whole]


names = st.text(alphabet="abcdefghij_-", min_size=1, max_size=120)
fields = st.dictionaries(
    st.sampled_from(["x", "y.png", "cls"]), st.binary(max_size=700), min_size=1
)


def write_tar(path: Path, samples: list, form: int) -> None:
    """`samples` as members `d/<key>.<field>` after a folder, in tar format `form`."""
    with tarfile.open(path, "w", format=form) as tar:
        folder = tarfile.TarInfo("folder")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)  # not a file: skipped
        for key, parts in samples:
            for field, data in parts.items():
                info = tarfile.TarInfo(f"d/{key}.{field}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


@settings(max_examples=30, deadline=None)
@given(
    samples=st.lists(st.tuples(names, fields), max_size=6, unique_by=lambda sample: sample[0]),
    form=st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]),
)
def test_the_tar_reader_reads_what_tarfile_writes(
    samples: list, form: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Long names (GNU, pax), folders and every size come back as the same samples."""
    path = tmp_path_factory.mktemp("tar") / "shard.tar"
    if form == tarfile.USTAR_FORMAT:  # ustar: names of up to 100 bytes
        samples = list({key[:90]: (key[:90], fields) for key, fields in samples}.values())
    write_tar(path, samples, form)
    read = list(pkg("data.tars").read_tar(path))
    assert read == [{"__key__": f"d/{key}", **parts} for key, parts in samples]


@pytest.mark.parametrize(
    "form",
    [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT],
    ids=["ustar", "gnu", "pax"],
)
@settings(max_examples=3, deadline=None)  # each example reads its shard cut at every byte
@given(
    samples=st.lists(
        st.tuples(
            names,
            st.dictionaries(st.sampled_from(["x", "cls"]), st.binary(max_size=300), min_size=1),
        ),
        min_size=1,
        max_size=3,
        unique_by=lambda sample: sample[0][:90],
    )
)
def test_a_tar_cut_at_any_byte_is_refused_or_read_whole(
    form: int, samples: list, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Never in part: a cut before the end of the first zero block after the last member (the
    end-of-archive marker's first block) is refused in one line; a cut after it reads whole.

    Header boundaries, the marker's second block and the padding to a whole record included.
    A long path of folders goes into the ustar prefix, a GNU long name or a pax header.
    """
    tars, error = pkg("data.tars"), pkg("errors").DataError
    samples = [(key[:90], parts) for key, parts in samples] + [("long/" * 25 + "k", {"x": b"1"})]
    path = tmp_path_factory.mktemp("tar") / "shard.tar"
    write_tar(path, samples, form)
    whole = list(tars.read_tar(path))
    assert [sample["__key__"] for sample in whole] == [f"d/{key}" for key, _ in samples]
    with tarfile.open(path) as tar:
        last = tar.getmembers()[-1]
    marker = last.offset_data + -(-last.size // 512) * 512  # the first zero block
    for cut in range(path.stat().st_size, -1, -1):  # a plain loop: every byte, from the end
        os.truncate(path, cut)
        try:
            read = list(tars.read_tar(path))
        except error as refused:
            assert cut < marker + 512, f"cut at {cut} refused: {refused}"
            assert str(refused).startswith(f"{path}: ") and "\n" not in str(refused)
        else:
            assert read == whole, f"cut at {cut}: read as {len(read)} of {len(whole)} samples"
            assert cut >= marker + 512, f"cut at {cut}, before the first zero block ends: read"
