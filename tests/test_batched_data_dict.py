"""BatchedDataDict: stacking, row selection, sharding, repeats, devices, pickling (zero-copy)."""

import copy
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_data.batched_data_dict import BatchedDataDict, SlicedDataDict
from rl_data.packed_tensor import PackedTensor

PAD_ID = 151643


def assert_same(actual, expected):
    """Same keys in the same order; tensors equal in dtype, shape and values."""
    assert list(actual.keys()) == list(expected.keys())
    for key in expected:
        a, e = actual[key], expected[key]
        assert type(a) is type(e), key
        if isinstance(e, torch.Tensor):
            assert (a.dtype, tuple(a.shape)) == (e.dtype, tuple(e.shape)), key
            assert torch.equal(a, e), key
        elif isinstance(e, PackedTensor):
            assert a.equal(e), key
        else:
            assert a == e, key


def sample_batch(num_rows=6, seq_len=4):
    """Rows r = 0..num_rows-1, every value derived from r so any row mix-up shows."""
    r = torch.arange(num_rows)
    return BatchedDataDict(
        {
            "input_ids": (r[:, None] * 10 + torch.arange(seq_len)).to(torch.int64),
            "input_lengths": (r + 1).to(torch.int32),
            "logprobs": (r[:, None] + torch.arange(seq_len) / 10).to(torch.bfloat16),
            "idx": [f"s{i}" for i in range(num_rows)],
            "pixel_values": PackedTensor(
                [
                    None if i % 3 == 2 else torch.full((i % 3 + 1, 2), float(i))
                    for i in range(num_rows)
                ],
                dim_to_pack=0,
            ),
        }
    )


# --- from_batches -------------------------------------------------------------------------


def test_from_batches_concatenates_and_right_pads_with_per_key_values():
    first = {
        "input_ids": torch.tensor([[1, 2, 3]]),
        "token_mask": torch.tensor([[False, True, True]]),
        "logprobs": torch.tensor([[0.5, 0.25, 0.125]], dtype=torch.float32),
        "topk": torch.tensor([[[1, 2], [3, 4]]], dtype=torch.int32),
        "input_lengths": torch.tensor([3], dtype=torch.int32),
        "idx": [7],
        "pixel_values": PackedTensor([torch.ones(2, 3)], dim_to_pack=0),
    }
    second = {
        "input_ids": torch.tensor([[4, 5, 6, 7, 8], [9, 10, 11, 12, 13]]),
        "token_mask": torch.tensor([[True] * 5, [True] * 5]),
        "logprobs": torch.tensor([[1.0] * 5, [2.0] * 5]),
        "topk": torch.tensor(
            [[[5, 6], [7, 8], [9, 10]], [[0, 0], [0, 0], [1, 1]]], dtype=torch.int32
        ),
        "input_lengths": torch.tensor([5, 5], dtype=torch.int32),
        "idx": [8, 9],
        "pixel_values": PackedTensor([None, torch.zeros(1, 3)], dim_to_pack=0),
    }
    stacked = BatchedDataDict.from_batches(
        [first, second], pad_value_dict={"input_ids": PAD_ID, "logprobs": -1.5, "topk": -1}
    )
    assert type(stacked) is BatchedDataDict
    assert_same(
        stacked,
        {
            "input_ids": torch.tensor(
                [[1, 2, 3, PAD_ID, PAD_ID], [4, 5, 6, 7, 8], [9, 10, 11, 12, 13]]
            ),
            "token_mask": torch.tensor([[False, True, True, False, False]] + [[True] * 5] * 2),
            "logprobs": torch.tensor(
                [[0.5, 0.25, 0.125, -1.5, -1.5], [1.0] * 5, [2.0] * 5], dtype=torch.float32
            ),
            "topk": torch.tensor(
                [
                    [[1, 2], [3, 4], [-1, -1]],
                    [[5, 6], [7, 8], [9, 10]],
                    [[0, 0], [0, 0], [1, 1]],
                ],
                dtype=torch.int32,
            ),
            "input_lengths": torch.tensor([3, 5, 5], dtype=torch.int32),
            "idx": [7, 8, 9],
            "pixel_values": PackedTensor([torch.ones(2, 3), None, torch.zeros(1, 3)], 0),
        },
    )
    assert stacked.size == 3


def test_from_batches_keeps_first_batch_key_order_and_accepts_batched_data_dicts():
    a = BatchedDataDict({"b": [1], "a": torch.tensor([1])})
    b = {"a": torch.tensor([2]), "b": [2]}
    stacked = SlicedDataDict.from_batches([a, b])
    assert type(stacked) is SlicedDataDict
    assert_same(stacked, {"b": [1, 2], "a": torch.tensor([1, 2])})


@pytest.mark.parametrize(
    "batches, error, message",
    [
        ([], ValueError, r"^from_batches needs at least one batch, got an empty sequence$"),
        (
            [{"a": [1], "b": [1]}, {"a": [2], "c": [2]}],
            ValueError,
            r"^batch 1 has different keys than batch 0: missing \['b'\], extra \['c'\]; "
            r"every batch must have the same keys$",
        ),
        (
            [{"a": torch.tensor([1])}, {"a": [2]}],
            TypeError,
            r"^cannot stack key 'a': found values of types \['Tensor', 'list'\]",
        ),
        (
            [{"a": (1,)}],
            TypeError,
            r"^cannot stack key 'a': found values of types \['tuple'\]",
        ),
        (
            [{"a": torch.tensor([1], dtype=torch.int32)}, {"a": torch.tensor([2])}],
            ValueError,
            r"^cannot stack key 'a': tensors have different dtypes "
            r"\['torch.int32', 'torch.int64'\]; cast them to one dtype first$",
        ),
        (
            [{"a": torch.zeros(1, 2)}, {"a": torch.zeros(1)}],
            ValueError,
            r"^cannot stack key 'a': tensor shapes \[\(1, 2\), \(1,\)\] differ in rank",
        ),
        (
            [{"a": torch.zeros(1, 2, 3)}, {"a": torch.zeros(1, 2, 4)}],
            ValueError,
            r"differ in rank or in dims after dim 1; only dim 0 \(rows\) and dim 1",
        ),
        ([{"a": torch.tensor(1)}], ValueError, r"tensor shapes \[\(\)\] differ in rank"),
        (
            [{"p": PackedTensor([None], 0)}, {"p": PackedTensor([None], 1)}],
            ValueError,
            r"all inputs must share dim_to_pack, got \[0, 1\]",
        ),
    ],
)
def test_from_batches_errors(batches, error, message):
    with pytest.raises(error, match=message):
        BatchedDataDict.from_batches(batches)


# --- size ---------------------------------------------------------------------------------


def test_size_counts_rows_and_reports_disagreement():
    assert sample_batch(5).size == 5
    assert BatchedDataDict().size == 0
    bad = BatchedDataDict({"a": torch.zeros(3, 2), "b": [1, 2], "c": PackedTensor([None] * 3, 0)})
    with pytest.raises(ValueError) as info:
        _ = bad.size
    assert str(info.value) == (
        "values disagree on the batch size: {'a': 3, 'b': 2, 'c': 3}; every tensor (dim 0), "
        "PackedTensor and list must have the same number of rows"
    )
    with pytest.raises(
        ValueError, match=r"^value for key 'x' is a 0-d tensor; it has no batch dimension$"
    ):
        _ = BatchedDataDict({"x": torch.tensor(3)}).size
    with pytest.raises(TypeError, match=r"^value for key 'x' is a tuple; BatchedDataDict holds"):
        _ = BatchedDataDict({"x": (1, 2)}).size


# --- slice / select_indices / chunk -------------------------------------------------------


def test_slice_returns_rows_as_views():
    batch = sample_batch(6)
    part = batch.slice(2, 5)
    assert type(part) is SlicedDataDict
    assert_same(part, batch.select_indices([2, 3, 4]))
    assert part["input_ids"].data_ptr() == batch["input_ids"][2].data_ptr()  # a view, no copy
    assert (
        part["pixel_values"].tensors[0] is None
        and part["pixel_values"].tensors[1] is batch["pixel_values"].tensors[3]
    )
    assert batch.slice(3, 3).size == 0


@pytest.mark.parametrize("start, end", [(-1, 2), (4, 3), (0, 7)])
def test_slice_out_of_range(start, end):
    with pytest.raises(
        IndexError, match=rf"^slice \[{start}, {end}\) is outside the batch of 6 rows"
    ):
        sample_batch(6).slice(start, end)


def test_select_indices_picks_rows_in_given_order():
    batch = sample_batch(4)
    picked = batch.select_indices([3, 0, 3])
    assert type(picked) is BatchedDataDict
    assert_same(
        picked,
        {
            "input_ids": torch.tensor([[30, 31, 32, 33], [0, 1, 2, 3], [30, 31, 32, 33]]),
            "input_lengths": torch.tensor([4, 1, 4], dtype=torch.int32),
            "logprobs": batch["logprobs"][[3, 0, 3]],
            "idx": ["s3", "s0", "s3"],
            "pixel_values": PackedTensor(
                [torch.full((1, 2), 3.0), torch.full((1, 2), 0.0), torch.full((1, 2), 3.0)], 0
            ),
        },
    )
    assert_same(
        batch.select_indices(torch.tensor([False, True, False, True])), batch.select_indices([1, 3])
    )
    assert_same(batch.select_indices(torch.tensor([-1])), batch.select_indices([3]))
    with pytest.raises(IndexError, match=r"^row index 4 is out of range for 4 rows$"):
        batch.select_indices([4])


def test_chunk_returns_one_contiguous_part_as_copies():
    batch = sample_batch(6)
    middle = batch.chunk(rank=1, chunks=3)
    assert type(middle) is SlicedDataDict
    assert_same(middle, batch.select_indices([2, 3]))
    middle["input_ids"][0, 0] = -1
    assert batch["input_ids"][2, 0] == 20  # a copy: the global batch is untouched
    with pytest.raises(
        ValueError,
        match=r"^cannot split 6 rows into 4 equal chunks; chunks must be a positive divisor",
    ):
        batch.chunk(0, 4)
    with pytest.raises(ValueError, match=r"^rank 3 is out of range for 3 chunks \(0\.\.2\)$"):
        batch.chunk(3, 3)


# --- shard_by_batch_size ------------------------------------------------------------------


def test_shard_by_batch_size_without_batch_size_splits_contiguously():
    batch = BatchedDataDict({"problem_id": [0, 0, 1, 1, 2, 2, 3, 3], "data": torch.arange(1, 9)})
    shards = batch.shard_by_batch_size(shards=2)
    assert [type(s) for s in shards] == [SlicedDataDict, SlicedDataDict]
    assert_same(shards[0], {"problem_id": [0, 0, 1, 1], "data": torch.tensor([1, 2, 3, 4])})
    assert_same(shards[1], {"problem_id": [2, 2, 3, 3], "data": torch.tensor([5, 6, 7, 8])})


def test_shard_by_batch_size_spreads_every_block_over_all_shards():
    batch = BatchedDataDict({"problem_id": [0, 0, 1, 1, 2, 2, 3, 3], "data": torch.arange(1, 9)})
    shards = batch.shard_by_batch_size(shards=2, batch_size=4)
    assert_same(shards[0], {"problem_id": [0, 0, 2, 2], "data": torch.tensor([1, 2, 5, 6])})
    assert_same(shards[1], {"problem_id": [1, 1, 3, 3], "data": torch.tensor([3, 4, 7, 8])})


def test_shard_by_batch_size_handles_packed_tensors_and_regroups_exactly():
    batch = sample_batch(12)
    shards = batch.shard_by_batch_size(shards=3, batch_size=6)
    expected_rows = [[0, 1, 6, 7], [2, 3, 8, 9], [4, 5, 10, 11]]
    for shard, rows in zip(shards, expected_rows, strict=True):
        assert_same(shard, batch.select_indices(rows))
    regrouped = BatchedDataDict.from_batches(shards)
    assert_same(regrouped, batch.select_indices(sum(expected_rows, [])))


@pytest.mark.parametrize(
    "shards, batch_size, message",
    [
        (0, None, r"^shards must be positive, got 0$"),
        (2, 4, r"^batch size 6 is not a multiple of batch_size=4; pass a batch_size that divides"),
        (2, 0, r"^batch size 6 is not a multiple of batch_size=0"),
        (
            4,
            None,
            r"^batch_size 6 is not a multiple of shards=4; "
            r"each block must split into equal shards$",
        ),
    ],
)
def test_shard_by_batch_size_errors(shards, batch_size, message):
    with pytest.raises(ValueError, match=message):
        sample_batch(6).shard_by_batch_size(shards, batch_size)


# --- repeat_interleave / to / get_multimodal_dict -----------------------------------------


def test_repeat_interleave_repeats_each_row_and_deep_copies_list_items():
    batch = BatchedDataDict(
        {
            "ids": torch.tensor([[1, 2], [3, 4]]),
            "meta": [{"n": 0}, {"n": 1}],
            "pix": PackedTensor([torch.ones(1), None], 0),
        }
    )
    repeated = batch.repeat_interleave(3)
    assert type(repeated) is BatchedDataDict and repeated.size == 6
    assert torch.equal(repeated["ids"], torch.tensor([[1, 2]] * 3 + [[3, 4]] * 3))
    assert repeated["meta"] == [{"n": 0}] * 3 + [{"n": 1}] * 3
    repeated["meta"][0]["n"] = 99
    assert repeated["meta"][1] == {"n": 0} and batch["meta"][0] == {"n": 0}
    assert [t is None for t in repeated["pix"].tensors] == [False] * 3 + [True] * 3
    assert_same(batch.repeat_interleave(1), batch)
    with pytest.raises(ValueError, match=r"^num_repeats must be a positive int, got 0$"):
        batch.repeat_interleave(0)


def test_to_moves_tensors_and_packed_rows_in_place():
    batch = sample_batch(3)
    assert batch.to("meta") is batch
    assert {k: v.device.type for k, v in batch.items() if isinstance(v, torch.Tensor)} == {
        "input_ids": "meta",
        "input_lengths": "meta",
        "logprobs": "meta",
    }
    assert [t is None or t.device.type == "meta" for t in batch["pixel_values"].tensors] == [
        True
    ] * 3
    assert batch["idx"] == ["s0", "s1", "s2"]
    assert batch["logprobs"].dtype == torch.bfloat16


def test_get_multimodal_dict_returns_packed_entries_and_optional_model_keys():
    batch = sample_batch(3)
    batch["token_type_ids"] = torch.zeros(3, 4, dtype=torch.int64)
    mm = batch.get_multimodal_dict()
    assert list(mm) == ["pixel_values", "token_type_ids"]
    assert mm["pixel_values"] is batch["pixel_values"]
    assert mm["token_type_ids"] is batch["token_type_ids"]

    packed = batch.get_multimodal_dict(as_tensors=True)
    assert torch.equal(packed["pixel_values"], torch.tensor([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]))

    on_meta = batch.get_multimodal_dict(as_tensors=True, device="meta")
    assert (
        on_meta["pixel_values"].device.type == "meta"
        and on_meta["token_type_ids"].device.type == "meta"
    )
    assert batch["pixel_values"].tensors[0].device.type == "cpu"
    assert BatchedDataDict({"input_ids": torch.zeros(1, 2)}).get_multimodal_dict() == {}


# --- round trips (hypothesis) -------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(num_rows=st.integers(1, 12), data=st.data())
def test_pieces_and_chunks_stack_back_to_the_original(num_rows, data):
    batch = sample_batch(num_rows)
    cuts = sorted(data.draw(st.lists(st.integers(0, num_rows), max_size=4)))
    bounds = [0, *cuts, num_rows]
    pieces = [batch.slice(s, e) for s, e in zip(bounds, bounds[1:], strict=False)]
    assert_same(BatchedDataDict.from_batches(pieces), batch)

    chunks = data.draw(st.sampled_from([d for d in range(1, num_rows + 1) if num_rows % d == 0]))
    parts = [batch.chunk(r, chunks) for r in range(chunks)]
    assert_same(BatchedDataDict.from_batches(parts), batch)
    for part, shard in zip(parts, batch.shard_by_batch_size(chunks), strict=True):
        assert_same(shard, part)

    rows = data.draw(st.lists(st.integers(-num_rows, num_rows - 1), max_size=8))
    assert_same(
        batch.select_indices(rows).select_indices(list(range(len(rows)))),
        batch.select_indices(rows),
    )
    assert_same(batch.repeat_interleave(2).select_indices(list(range(0, 2 * num_rows, 2))), batch)


# --- pickling / object store --------------------------------------------------------------

ALL_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.float8_e4m3fn,
    torch.uint16,
]


def every_dtype_batch():
    base = torch.arange(-3, 3, dtype=torch.float32).reshape(3, 2) / 4  # [-0.75 .. 0.5]
    values = {}
    for dtype in ALL_DTYPES:
        if dtype == torch.bool:
            value = base > 0
        elif dtype in (torch.uint8, torch.uint16):
            value = (base * 4).abs().to(dtype)
        else:
            value = base.to(dtype)
        values[str(dtype).removeprefix("torch.")] = value
    values["empty_rows"] = torch.zeros(3, 0, dtype=torch.int64)
    values["transposed"] = torch.arange(6, dtype=torch.int32).reshape(2, 3).t()  # non-contiguous
    values["ids"] = ["a", "b", "c"]
    values["pix"] = PackedTensor(
        [torch.ones(2, 2, dtype=torch.bfloat16), None, torch.zeros(0, 2, dtype=torch.bfloat16)], 0
    )
    return BatchedDataDict(values)


def assert_bitwise_same(actual, expected):
    assert list(actual) == list(expected)
    for key, e in expected.items():
        a = actual[key]
        if isinstance(e, torch.Tensor):
            assert (a.dtype, a.shape) == (e.dtype, e.shape), key
            assert (
                a.contiguous().view(torch.uint8).tolist()
                == e.contiguous().view(torch.uint8).tolist()
            ), key
        else:
            assert_same({key: a}, {key: e})


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_pickle_round_trip_is_exact_for_every_dtype(protocol):
    batch = every_dtype_batch()
    restored = pickle.loads(pickle.dumps(batch, protocol=protocol))
    assert type(restored) is BatchedDataDict
    assert_bitwise_same(restored, batch)
    restored["float32"][0, 0] = 42.0  # writable, independent copy
    assert batch["float32"][0, 0] == -0.75


def test_pickle_keeps_subclass_and_detaches():
    sliced = SlicedDataDict({"w": torch.ones(2, requires_grad=True)})
    restored = pickle.loads(pickle.dumps(sliced))
    assert type(restored) is SlicedDataDict and not restored["w"].requires_grad
    assert torch.equal(restored["w"], torch.ones(2))


def test_deepcopy_is_independent():
    batch = sample_batch(3)
    copied = copy.deepcopy(batch)
    assert_same(copied, batch)
    copied["input_ids"][0, 0] = -5
    assert batch["input_ids"][0, 0] == 0


def test_pickling_a_slice_sends_only_its_rows():
    big = BatchedDataDict({"x": torch.zeros(10_000, 128, dtype=torch.float32)})
    part = big.slice(0, 10)
    payload = pickle.dumps(part, protocol=5)
    assert len(payload) < part["x"].nbytes + 1024  # 5 KB of rows, not the 5 MB storage


def _received(buffers):
    """The out-of-band buffers as a receiver gets them (read-only copies), and their address ranges."""
    readonly = [pickle.PickleBuffer(bytes(memoryview(b))) for b in buffers]
    ranges = []
    for b in readonly:
        array = np.frombuffer(memoryview(b), dtype=np.uint8)
        ranges.append((array.ctypes.data, array.ctypes.data + array.nbytes))
    return readonly, ranges


def _inside(tensor, ranges):
    return any(lo <= tensor.data_ptr() and tensor.data_ptr() + tensor.nbytes <= hi for lo, hi in ranges)


def test_protocol5_moves_tensor_bytes_out_of_band_and_loads_without_copying():
    batch = every_dtype_batch()
    buffers = []
    stream = pickle.dumps(batch, protocol=5, buffer_callback=buffers.append)
    tensor_bytes = sum(v.nbytes for v in batch.values() if isinstance(v, torch.Tensor))
    assert sum(memoryview(b).nbytes for b in buffers) == tensor_bytes + sum(
        t.nbytes for t in batch["pix"].tensors if t is not None
    )
    assert len(buffers) <= len(ALL_DTYPES) + 1  # small tensors: one buffer per dtype
    assert len(stream) < 4096  # only metadata stays in band

    readonly, ranges = _received(buffers)
    restored = pickle.loads(stream, buffers=readonly)
    assert_bitwise_same(restored, batch)
    assert all(_inside(restored[k], ranges) for k in ("float32", "bfloat16", "transposed"))  # views, no copy


def message_log_batch(num_rows=16, turns=30):
    logs = [
        [
            {"role": "user" if t % 2 == 0 else "assistant", "content": f"turn {t}", "token_ids": torch.arange(t + r, 2 * t + r + 5)}
            for t in range(turns)
        ]
        for r in range(num_rows)
    ]
    return BatchedDataDict(
        {
            "message_log": logs,
            "loss_multiplier": torch.ones(num_rows),
            "big": torch.arange(num_rows * 10_000, dtype=torch.int32).reshape(num_rows, 10_000),
            "source_ids": [f"s{r}" for r in range(num_rows)],
        }
    )


def test_many_small_nested_tensors_travel_as_one_buffer_per_dtype():
    batch = message_log_batch()
    buffers = []
    stream = pickle.dumps(batch, protocol=5, buffer_callback=buffers.append)
    # int64 token ids (480 tensors) pooled, float32 multipliers pooled, the 640 KB tensor alone
    assert sorted(memoryview(b).nbytes for b in buffers) == sorted(
        [
            sum(m["token_ids"].nbytes for log in batch["message_log"] for m in log),
            batch["loss_multiplier"].nbytes,
            batch["big"].nbytes,
        ]
    )
    readonly, ranges = _received(buffers)
    restored = pickle.loads(stream, buffers=readonly)
    as_lists = lambda logs: [[{**m, "token_ids": m["token_ids"].tolist()} for m in log] for log in logs]  # noqa: E731
    assert as_lists(restored["message_log"]) == as_lists(batch["message_log"])
    assert_same({k: v for k, v in restored.items() if k != "message_log"}, {k: v for k, v in batch.items() if k != "message_log"})
    assert all(_inside(m["token_ids"], ranges) for log in restored["message_log"] for m in log)
    assert _inside(restored["big"], ranges)


def test_a_tensor_met_twice_is_sent_once_and_nested_dicts_round_trip():
    shared = torch.arange(5)
    inner = BatchedDataDict({"x": torch.ones(2, 3), "names": ["a", "b"]})
    batch = BatchedDataDict({"a": [shared, shared], "inner": [inner, inner], "grad": [torch.ones(3, requires_grad=True)]})
    buffers = []
    restored = pickle.loads(pickle.dumps(batch, protocol=5, buffer_callback=buffers.append), buffers=buffers)
    first, second = restored["a"]
    assert first is second and torch.equal(first, shared)
    assert type(restored["inner"][0]) is BatchedDataDict and restored["inner"][0] is restored["inner"][1]
    assert_same(restored["inner"][0], inner)
    assert not restored["grad"][0].requires_grad and torch.equal(restored["grad"][0], torch.ones(3))


@pytest.mark.timeout(120)
def test_ray_object_store_round_trip_is_exact_and_zero_copy(ray_session):
    ray = ray_session
    batch = every_dtype_batch()
    batch["big"] = torch.arange(3 * 100_000, dtype=torch.int64).reshape(
        3, 100_000
    )  # > inline limit
    ref = ray.put(batch)
    first, second = ray.get(ref, timeout=60), ray.get(ref, timeout=60)
    assert_bitwise_same(first, batch)
    assert first["big"].data_ptr() == second["big"].data_ptr()  # both view the shared store

    @ray.remote
    def row_sums(b):
        return b["big"].sum(dim=1), b["bfloat16"].dtype, type(b).__name__

    sums, dtype, name = ray.get(row_sums.remote(ref), timeout=60)
    assert torch.equal(sums, batch["big"].sum(dim=1)) and dtype == torch.bfloat16
    assert name == "BatchedDataDict"


def test_pooled_list_pickles_its_tensors_in_one_buffer_per_dtype_and_unpickles_as_a_list():
    from rl_data.batched_data_dict import PooledList

    items = [{"uid": (0, i), "log": [{"role": "user", "token_ids": torch.arange(i, i + 5)}], "mask": torch.ones(3)}
             for i in range(20)]  # fmt: skip
    buffers = []
    data = pickle.dumps(PooledList(items), protocol=5, buffer_callback=buffers.append)
    back = pickle.loads(data, buffers=buffers)
    assert type(back) is list and len(back) == 20
    for got, want in zip(back, items):
        assert got["uid"] == want["uid"] and torch.equal(got["log"][0]["token_ids"], want["log"][0]["token_ids"])
        assert got["log"][0]["token_ids"].dtype == torch.long and torch.equal(got["mask"], want["mask"])
    assert len(buffers) == 2  # int64 and float32 pools, not 40 tensors


def test_worker_process_pickling_keeps_tensors_out_of_the_pickle():
    """Energon / DataLoader workers send batches with torch's ForkingPickler: tensors must go
    through shared memory (not be copied in band), small ones still pooled."""
    from multiprocessing.reduction import ForkingPickler

    big = torch.arange(4 * 1024 * 1024, dtype=torch.float32).reshape(4, -1)  # 16 MB
    logs = [[{"role": "user", "token_ids": torch.arange(n)}] for n in (3, 5, 7)]
    batch = BatchedDataDict(pixel_values=big, message_log=logs, source_ids=["a", "b", "c"])
    payload = bytes(ForkingPickler.dumps(batch))
    assert len(payload) < 64 * 1024  # the 16 MB tensor is a shared-memory handle
    again = pickle.loads(payload)
    assert type(again) is BatchedDataDict and again["source_ids"] == ["a", "b", "c"]
    assert torch.equal(again["pixel_values"], big)
    assert [m[0]["token_ids"].tolist() for m in again["message_log"]] == [list(range(n)) for n in (3, 5, 7)]
