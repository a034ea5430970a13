"""PackedTensor: per-row tensors packed along one dim, sliced and joined by row."""

import pytest
import torch

from rl_data.packed_tensor import PackedTensor, normalize_row_indices


def rows_2x3_1x3_none():
    return PackedTensor(
        [
            torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int16),
            torch.tensor([[7, 8, 9]], dtype=torch.int16),
            None,
        ],
        dim_to_pack=0,
    )


def test_single_tensor_is_one_row():
    t = torch.arange(6).reshape(2, 3)
    packed = PackedTensor(t, dim_to_pack=0)
    assert len(packed) == 1
    assert packed.tensors[0] is t


def test_as_tensor_concatenates_along_dim_to_pack_and_skips_none_rows():
    packed = rows_2x3_1x3_none()
    out = packed.as_tensor()
    assert out.dtype == torch.int16
    assert torch.equal(out, torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]], dtype=torch.int16))
    assert len(packed) == 3  # the None row still counts as a row

    along_1 = PackedTensor([torch.zeros(2, 1), torch.ones(2, 2)], dim_to_pack=1).as_tensor()
    assert torch.equal(along_1, torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]]))


def test_as_tensor_of_only_none_rows_is_none():
    assert PackedTensor([None, None], dim_to_pack=0).as_tensor() is None
    assert PackedTensor([], dim_to_pack=0).as_tensor() is None


def test_as_tensor_with_device_leaves_rows_in_place():
    packed = rows_2x3_1x3_none()
    out = packed.as_tensor(device="meta")
    assert out.device.type == "meta" and tuple(out.shape) == (3, 3)
    assert all(t is None or t.device.type == "cpu" for t in packed.tensors)


def test_to_moves_rows_in_place_and_returns_self():
    packed = rows_2x3_1x3_none()
    assert packed.to("meta") is packed
    assert [None if t is None else (t.device.type, t.dtype) for t in packed.tensors] == [
        ("meta", torch.int16),
        ("meta", torch.int16),
        None,
    ]


def test_slice_selects_rows_in_order_and_shares_them():
    packed = rows_2x3_1x3_none()
    picked = packed.slice([1, 0, 1])
    assert len(picked) == 3 and picked.dim_to_pack == 0
    assert picked.tensors[0] is packed.tensors[1]
    assert picked.tensors[1] is packed.tensors[0]
    assert picked.tensors[2] is packed.tensors[1]
    assert packed.slice(torch.tensor([2])).tensors == [None]
    assert packed.slice([-1]).tensors == [None]
    mask = packed.slice(torch.tensor([True, False, True]))
    assert mask.tensors[0] is packed.tensors[0] and mask.tensors[1] is None
    assert len(packed.slice([])) == 0


def test_slice_rejects_bad_indices_with_clear_errors():
    packed = rows_2x3_1x3_none()
    with pytest.raises(IndexError, match=r"^row index 3 is out of range for 3 rows$"):
        packed.slice([0, 3])
    with pytest.raises(IndexError, match=r"^row index -4 is out of range for 3 rows$"):
        packed.slice([-4])
    with pytest.raises(ValueError, match=r"boolean row mask has 2 entries, expected 3"):
        packed.slice(torch.tensor([True, False]))
    with pytest.raises(TypeError, match=r"row indices must be integers, got a torch.float32"):
        packed.slice(torch.tensor([0.0]))
    with pytest.raises(TypeError, match=r"row indices must be ints, got True \(bool\)"):
        packed.slice([True])
    with pytest.raises(ValueError, match=r"1-D tensor, got shape \(1, 1\)"):
        packed.slice(torch.tensor([[0]]))


def test_normalize_row_indices_returns_non_negative_ints():
    assert normalize_row_indices(range(3), 3) == [0, 1, 2]
    assert normalize_row_indices([-1, -3], 3) == [2, 0]
    assert normalize_row_indices(torch.tensor([2, 2], dtype=torch.int32), 3) == [2, 2]


def test_concat_joins_rows():
    a = rows_2x3_1x3_none()
    b = PackedTensor([torch.tensor([[0, 0, 0]], dtype=torch.int16)], dim_to_pack=0)
    joined = PackedTensor.concat([a, b])
    assert len(joined) == 4
    assert [t is u for t, u in zip(joined.tensors, a.tensors + b.tensors, strict=True)] == [
        True
    ] * 4
    assert torch.equal(joined.as_tensor(), torch.cat([a.as_tensor(), b.as_tensor()]))


def test_flattened_concat_packs_each_input_into_one_row():
    a = rows_2x3_1x3_none()
    b = PackedTensor([torch.tensor([[0, 0, 0]], dtype=torch.int16)], dim_to_pack=0)
    empty = PackedTensor([None], dim_to_pack=0)
    flat = PackedTensor.flattened_concat([a, empty, b])
    assert len(flat) == 3
    assert torch.equal(flat.tensors[0], a.as_tensor())
    assert flat.tensors[1] is None
    assert torch.equal(flat.as_tensor(), PackedTensor.concat([a, empty, b]).as_tensor())


@pytest.mark.parametrize("method", ["concat", "flattened_concat"])
def test_joining_needs_a_common_dim_and_at_least_one_input(method):
    join = getattr(PackedTensor, method)
    with pytest.raises(
        ValueError, match=rf"PackedTensor.{method}: all inputs must share dim_to_pack, got \[0, 1\]"
    ):
        join([PackedTensor([None], 0), PackedTensor([None], 1)])
    with pytest.raises(ValueError, match=rf"PackedTensor.{method} needs at least one PackedTensor"):
        join([])


def test_constructor_rejects_wrong_types():
    with pytest.raises(
        TypeError, match=r"PackedTensor row 1 is a list; expected a torch.Tensor or None"
    ):
        PackedTensor([torch.zeros(1), [1, 2]], dim_to_pack=0)
    with pytest.raises(TypeError, match=r"dim_to_pack must be an int, got '0'"):
        PackedTensor([torch.zeros(1)], dim_to_pack="0")
    with pytest.raises(TypeError, match=r"got dict"):
        PackedTensor({"a": torch.zeros(1)}, dim_to_pack=0)


def test_equal_compares_dim_rows_dtypes_and_values():
    a = rows_2x3_1x3_none()
    assert a.equal(rows_2x3_1x3_none())
    assert not a.equal(PackedTensor(a.tensors, dim_to_pack=1))
    assert not a.equal(a.slice([0, 1]))
    assert not a.equal(PackedTensor([t if t is None else t.to(torch.int32) for t in a.tensors], 0))
    assert not a.equal(PackedTensor(a.tensors[:2] + [torch.zeros(0, 3, dtype=torch.int16)], 0))
    assert not a.equal(a.as_tensor())


def test_repr_names_rows_and_shapes():
    assert (
        repr(rows_2x3_1x3_none())
        == "PackedTensor(rows=3, dim_to_pack=0, shapes=[(2, 3), (1, 3), None])"
    )
