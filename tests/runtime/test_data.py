"""pure tier: the token readers, packing, determinism, process sharding and bad input of `runtime.data`."""

import numpy as np
import pytest

from cost_models.errors import CpplanError
from runtime.data import open_dataset, synthetic_batches, text_batches
from runtime.data.packing import IGNORED_TARGET, inputs_and_targets, positions_in_segments, segments_from_eos

pytestmark = pytest.mark.pure

VOCAB = 1000
EOS = 0
# three documents, each ending with EOS: lengths 4, 3, 5, then 3 and 6
DOCUMENTS = [[5, 6, 7, EOS], [8, 9, EOS], [1, 2, 3, 4, EOS], [3, 3, EOS], [11, 12, 13, 14, 15, EOS]]
STREAM = np.concatenate(DOCUMENTS)  # 21 tokens


def windows(stream, seq_len):
    """Every row of an epoch, in stream order: seq_len+1 tokens with stride seq_len."""
    count = (len(stream) - 1) // seq_len
    return np.stack([stream[i * seq_len : i * seq_len + seq_len + 1] for i in range(count)])


def all_rows(dataset, steps, batch):
    return np.concatenate([dataset.batch(s, global_batch=batch).tokens for s in range(steps)])


@pytest.fixture
def files(tmp_path):
    """The stream as .npy (int32), raw uint16 and raw uint32."""
    paths = {"npy": tmp_path / "tokens.npy", "uint16": tmp_path / "tokens.u16", "uint32": tmp_path / "tokens.u32"}
    np.save(paths["npy"], STREAM.astype(np.int32))
    STREAM.astype("<u2").tofile(paths["uint16"])
    STREAM.astype("<u4").tofile(paths["uint32"])
    return paths


@pytest.mark.parametrize("form", ["npy", "uint16", "uint32"])
def test_each_epoch_visits_every_row_once_in_a_fresh_order(files, form):
    dtype = None if form == "npy" else form
    dataset = open_dataset(files[form], seq_len=4, vocab=VOCAB, seed=7, dtype=dtype)
    want = windows(STREAM, 4)  # 5 rows
    assert dataset.num_rows == len(want) == 5
    first, second = all_rows(dataset, 1, 5), dataset.batch(1, global_batch=5).tokens
    for epoch in (first, second):
        assert sorted(map(tuple, epoch)) == sorted(map(tuple, want))
    assert not np.array_equal(first, second), "the second epoch should be in another order"
    assert first.dtype == np.int32 and first.shape == (5, 5)


def test_the_three_forms_give_the_same_batches(files):
    batches = [
        open_dataset(files[f], seq_len=4, vocab=VOCAB, seed=3, dtype=None if f == "npy" else f)
        .batch(2, global_batch=3)
        .tokens
        for f in ("npy", "uint16", "uint32")
    ]
    np.testing.assert_array_equal(batches[0], batches[1])
    np.testing.assert_array_equal(batches[0], batches[2])


def test_uint32_keeps_ids_above_uint16(tmp_path):
    tokens = np.array([70_000, 1, 2, 99_999, 5], dtype="<u4")
    tokens.tofile(tmp_path / "big.bin")
    dataset = open_dataset(tmp_path / "big.bin", seq_len=4, vocab=100_000, dtype="uint32")
    np.testing.assert_array_equal(dataset.batch(0, global_batch=1).tokens[0], tokens)


def test_packing_by_eos_hand_computed(files):
    dataset = open_dataset(files["npy"], seq_len=6, vocab=VOCAB, pack=True, eos_id=EOS)
    rows = windows(STREAM, 6)  # [5 6 7 0 8 9 0], [0 1 2 3 4 0 3], [3 3 0 11 12 13 14]
    order = [np.flatnonzero((rows == r).all(axis=1))[0] for r in dataset.batch(0, global_batch=3).tokens]
    segments = dataset.batch(0, global_batch=3).segment_ids
    want = {0: [1, 1, 1, 1, 2, 2, 2], 1: [1, 2, 2, 2, 2, 2, 3], 2: [1, 1, 1, 2, 2, 2, 2]}
    for got, index in zip(segments, order):
        assert got.tolist() == want[index]
    tokens, targets, positions, ids = inputs_and_targets(rows[:1], np.array([want[0]]))
    assert tokens.tolist() == [[5, 6, 7, 0, 8, 9]]
    # the EOS ending the first document does not predict the second document's first token
    assert targets.tolist() == [[6, 7, 0, IGNORED_TARGET, 9, 0]]
    assert positions.tolist() == [[0, 1, 2, 3, 0, 1]]
    assert ids.tolist() == [[1, 1, 1, 1, 2, 2]]


def test_packing_by_offsets_equals_packing_by_eos(files, tmp_path):
    starts = np.concatenate([[0], np.cumsum([len(d) for d in DOCUMENTS])[:-1]])
    np.save(tmp_path / "starts.npy", starts)
    by_offsets = open_dataset(files["npy"], seq_len=6, vocab=VOCAB, pack=True, offsets=tmp_path / "starts.npy")
    by_eos = open_dataset(files["npy"], seq_len=6, vocab=VOCAB, pack=True, eos_id=EOS)
    for step in range(3):
        a, b = by_offsets.batch(step, global_batch=2), by_eos.batch(step, global_batch=2)
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_array_equal(a.segment_ids, b.segment_ids)


def test_positions_restart_in_each_segment():
    ids = np.array([[1, 1, 2, 2, 2, 3], [1, 1, 1, 1, 1, 1]])
    assert positions_in_segments(ids).tolist() == [[0, 1, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5]]


def test_unpacked_batches_have_no_segments_and_learn_every_target(files):
    batch = open_dataset(files["npy"], seq_len=4, vocab=VOCAB, eos_id=EOS).batch(0, global_batch=2)
    assert batch.segment_ids is None
    _, targets, positions, ids = inputs_and_targets(batch.tokens, None)
    assert ids is None and (targets >= 0).all() and positions[0].tolist() == [0, 1, 2, 3]


def test_same_step_same_batch_from_a_fresh_open(files):
    open_ = lambda seed: open_dataset(files["npy"], seq_len=4, vocab=VOCAB, seed=seed, pack=True, eos_id=EOS)
    a, b = open_(5).batch(9, global_batch=2), open_(5).batch(9, global_batch=2)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.segment_ids, b.segment_ids)
    other_seed = np.concatenate([open_(6).batch(s, global_batch=5).tokens for s in range(3)])
    assert not np.array_equal(np.concatenate([open_(5).batch(s, global_batch=5).tokens for s in range(3)]), other_seed)


@pytest.mark.parametrize("source", ["npy", None])
@pytest.mark.parametrize("processes", [2, 4])
def test_process_batches_concatenate_to_the_global_batch(files, source, processes):
    path = files["npy"] if source else None
    dataset = open_dataset(path, seq_len=4, vocab=VOCAB, seed=1, pack=bool(source), eos_id=EOS if source else None)
    for step in (0, 3):
        whole = dataset.batch(step, global_batch=8)
        parts = [
            dataset.batch(step, global_batch=8, process_index=p, process_count=processes) for p in range(processes)
        ]
        assert all(p.tokens.shape == (8 // processes, 5) for p in parts)
        np.testing.assert_array_equal(np.concatenate([p.tokens for p in parts]), whole.tokens)
        if source:
            np.testing.assert_array_equal(np.concatenate([p.segment_ids for p in parts]), whole.segment_ids)


def test_synthetic_is_the_default_and_deterministic():
    dataset = open_dataset(None, seq_len=16, vocab=50, seed=2)
    a = dataset.batch(4, global_batch=3)
    assert a.segment_ids is None and a.tokens.shape == (3, 17) and a.tokens.max() < 50
    np.testing.assert_array_equal(
        a.tokens, open_dataset("synthetic", seq_len=16, vocab=50, seed=2).batch(4, global_batch=3).tokens
    )
    assert not np.array_equal(a.tokens, dataset.batch(5, global_batch=3).tokens)
    np.testing.assert_array_equal(
        next(synthetic_batches(vocab=50, batch=3, seq_len=16, seed=2)), dataset.batch(0, global_batch=3).tokens
    )


def test_text_is_bytes(tmp_path):
    (tmp_path / "t.txt").write_bytes(b"hello, packed world")
    batch = open_dataset(tmp_path / "t.txt", seq_len=6, vocab=256).batch(0, global_batch=3)
    assert {bytes(r.astype(np.uint8)) for r in batch.tokens} == {b"hello, ", b" packed", b"d world"}
    stream = np.frombuffer(b"hello, packed world", np.uint8)
    np.testing.assert_array_equal(next(text_batches(stream, batch=3, seq_len=6, seed=0)), batch.tokens)


@pytest.mark.runtime_extra
def test_array_record_documents_are_records(tmp_path):
    pytest.importorskip("grain")
    writer_module = pytest.importorskip("array_record.python.array_record_module")
    for dtype in ("uint16", "uint32"):
        path = tmp_path / f"docs-{dtype}.array_record"
        writer = writer_module.ArrayRecordWriter(str(path), "group_size:1")
        for document in DOCUMENTS:
            writer.write(np.asarray(document, dtype=np.dtype(dtype).newbyteorder("<")).tobytes())
        writer.close()
        records = open_dataset(path, seq_len=6, vocab=VOCAB, pack=True, dtype=dtype, seed=4)
        batch = records.batch(0, global_batch=3)
        assert sorted(map(tuple, batch.tokens)) == sorted(map(tuple, windows(STREAM, 6)))
        # documents are the records: the same segment ids as the EOS rule gives for this stream
        np.testing.assert_array_equal(batch.segment_ids, segments_from_eos(batch.tokens, EOS))


BAD = [
    (lambda f, t: open_dataset(t / "missing.npy", seq_len=4, vocab=VOCAB), "does not exist"),
    (lambda f, t: open_dataset(t / "missing.bin", seq_len=4, vocab=VOCAB, dtype="uint16"), "does not exist"),
    (lambda f, t: open_dataset(f["uint16"], seq_len=4, vocab=VOCAB, dtype="int8"), "dtype 'int8'"),
    (lambda f, t: open_dataset(t / "tokens.bin", seq_len=4, vocab=VOCAB), "pass its dtype"),
    (lambda f, t: open_dataset(f["uint16"], seq_len=4, vocab=VOCAB, dtype="float32"), "is not supported"),
    (lambda f, t: open_dataset(f["npy"], seq_len=4, vocab=VOCAB, dtype="uint16"), "holds int32 tokens"),
    (lambda f, t: open_dataset(f["npy"], seq_len=4, vocab=10).batch(0, global_batch=5), "outside the model's"),
    (lambda f, t: open_dataset(f["npy"], seq_len=21, vocab=VOCAB), "fewer than one sequence"),
    (lambda f, t: open_dataset(f["npy"], seq_len=4, vocab=VOCAB, pack=True), "needs its document boundaries"),
    (lambda f, t: open_dataset(None, seq_len=4, vocab=VOCAB, pack=True), "synthetic data has no documents"),
    (
        lambda f, t: open_dataset(f["npy"], seq_len=4, vocab=VOCAB).batch(
            0, global_batch=3, process_index=0, process_count=2
        ),
        "does not split",
    ),
    (lambda f, t: open_dataset(f["npy"], seq_len=4, vocab=VOCAB).batch(-1, global_batch=2), "step=-1"),
    (lambda f, t: open_dataset(f["npy"], seq_len=4, vocab=VOCAB, pack=True, eos_id=VOCAB), "eos_id=1000"),
    (lambda f, t: open_dataset(f["npy"], seq_len=4, vocab=100), None),  # fine until a batch is read
]


@pytest.mark.parametrize("make,needle", BAD, ids=range(len(BAD)))
def test_bad_input_names_the_value_and_the_fix(files, tmp_path, make, needle):
    if needle is None:
        make(files, tmp_path)
        return
    with pytest.raises(CpplanError, match=needle):
        make(files, tmp_path)


def test_bad_files(tmp_path):
    np.save(tmp_path / "floats.npy", np.ones(10, dtype=np.float32))
    np.save(tmp_path / "matrix.npy", np.ones((3, 4), dtype=np.int32))
    (tmp_path / "odd.bin").write_bytes(b"\x01\x02\x03")
    np.save(tmp_path / "tokens.npy", STREAM)
    np.save(tmp_path / "bad_starts.npy", np.array([0, 5, 3]))
    cases = [
        (dict(source=tmp_path / "floats.npy"), "1-D float32"),
        (dict(source=tmp_path / "matrix.npy"), "2-D int32"),
        (dict(source=tmp_path / "odd.bin", dtype="uint16"), "not a multiple of 2"),
        (dict(source=tmp_path / "tokens.npy", offsets=tmp_path / "bad_starts.npy", pack=True), "increase strictly"),
        (dict(source=tmp_path), "cannot read training text"),
    ]
    for kwargs, needle in cases:
        with pytest.raises(CpplanError, match=needle):
            open_dataset(**kwargs, seq_len=2, vocab=VOCAB)
    (tmp_path / "t.txt").write_text("some text")
    with pytest.raises(CpplanError, match="at least 256"):
        open_dataset(tmp_path / "t.txt", seq_len=2, vocab=100)
