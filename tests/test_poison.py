"""harness.poison: fresh allocations inside ``allocations()`` come back NaN (0xFF / True for
integers and bools), zero under the control fill, nothing else is touched, and the mode nests
and unwinds like any TorchFunctionMode."""
from __future__ import annotations

import pytest
import torch

from harness import poison
from reference.checks import VerifyParityInputError

FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def _fresh(like: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One tensor from each uninitialised allocator."""
    return {
        "empty": torch.empty(5, 3, dtype=dtype),
        "empty_like": torch.empty_like(like, dtype=dtype),
        "empty_strided": torch.empty_strided((3, 4), (1, 3), dtype=dtype),
        "empty_permuted": torch.empty_permuted((2, 3, 4), (2, 0, 1), dtype=dtype),
        "new_empty": like.new_empty((7,), dtype=dtype),
        "new_empty_strided": like.new_empty_strided((2, 3), (1, 2), dtype=dtype),
    }


def _all_nan(t: torch.Tensor) -> bool:
    return bool(torch.isnan(t.float()).all())


@pytest.mark.parametrize("dtype", FLOATS)
def test_uninitialised_allocators_come_back_nan(dtype):
    like = torch.ones(4, 6)
    with poison.allocations() as mode:
        got = _fresh(like, dtype)
        kept = {"zeros": torch.zeros(4, dtype=dtype), "ones_like": torch.ones_like(like, dtype=dtype),
                "full": torch.full((3,), 2.0, dtype=dtype), "arange": torch.arange(4).to(dtype),
                "clone": like.clone().to(dtype)}
    assert mode.count == len(got)
    for name, t in got.items():
        assert _all_nan(t), f"{name} {dtype}: {t}"
    for name, t in kept.items():  # their contents are what the caller asked for
        assert not torch.isnan(t.float()).any(), name
    assert torch.equal(like, torch.ones(4, 6))


def test_integers_bools_and_the_zero_control():
    like = torch.ones(3)
    with poison.allocations():
        i32, u8 = torch.empty(4, dtype=torch.int32), torch.empty(4, dtype=torch.uint8)
        i64 = like.new_empty(2, dtype=torch.int64)
        b = torch.empty(3, dtype=torch.bool)
    assert (i32 == -1).all() and (u8 == 255).all() and (i64 == -1).all() and b.all()
    with poison.allocations(fill=0.0) as mode:
        zs = _fresh(like, torch.float32)
        zi, zb = torch.empty(4, dtype=torch.int32), torch.empty(3, dtype=torch.bool)
        z8 = torch.empty(4, dtype=torch.float8_e4m3fnuz)
    assert mode.count == len(zs) + 3
    assert all(bool((t == 0).all()) for t in zs.values()) and (zi == 0).all() and not zb.any()
    assert (z8.view(torch.uint8) == 0).all()


def test_outside_the_mode_nothing_is_filled():
    kept = torch.full((8,), 3.0)  # allocated before: existing tensors are never touched
    with poison.allocations() as mode:
        torch.empty(2)
    torch.empty(1 << 16), torch.empty_like(kept), kept.new_empty(3)  # after: no longer intercepted
    assert mode.count == 1 and torch.equal(kept, torch.full((8,), 3.0))
    assert torch._C._len_torch_function_stack() == 0


def test_modes_nest_inner_fill_wins_and_unwind_on_exceptions():
    with poison.allocations(fill=0.0) as outer:
        with poison.allocations() as inner:
            assert _all_nan(torch.empty(4))
        assert bool((torch.empty(4) == 0).all())  # the outer mode again
        with pytest.raises(RuntimeError, match="planted"):
            with poison.allocations():
                torch.empty(2)
                raise RuntimeError("planted")
        assert bool((torch.empty(4) == 0).all()), "the failed inner mode is gone, the outer still active"
    assert torch._C._len_torch_function_stack() == 0
    assert inner.count == 1 and outer.count == 4  # the outer also filled what the inner one then filled


def test_fill_must_be_nan_or_zero():
    with pytest.raises(VerifyParityInputError, match="fill"):
        poison.PoisonedAllocations(1.0)


def test_cached_memory_is_not_poisoned_on_the_cpu():
    assert poison.poison_cached_memory(torch.device("cpu")) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("fill, byte", [(poison.NAN, 0xFF), (0.0, 0x00)])
def test_caching_allocator_hands_out_poisoned_memory(fill, byte):
    """Allocations made outside the mode (as C++ makes them) after ``poison_cached_memory``:
    small-pool, large-pool and big ones start as ``byte``; a live tensor is untouched."""
    dev = torch.device("cuda")
    live = torch.arange(1 << 20, device=dev, dtype=torch.int32)
    gap = torch.empty(3 << 20, dtype=torch.uint8, device=dev)  # a free block inside a live segment once freed
    rest = torch.empty(1 << 20, dtype=torch.uint8, device=dev)
    del gap
    n = poison.poison_cached_memory(dev, fill=fill)
    assert n >= poison.CUDA_SMALL_BLOCKS * poison.CUDA_SMALL_BYTES
    # all allocated before any is checked: a check's own temporaries reuse (and dirty) freed memory
    got = [torch.ops.aten.empty.memory_format([size], dtype=torch.uint8, device=dev)
           for size in (512, 1000, 8192, 3 << 20, 32 << 20, 160 << 20)]  # < CUDA_BLOCK_BYTES
    for t in got:
        assert bool((t == byte).all()), f"{t.numel()} bytes: {int((t != byte).sum())} not {byte:#x}"
    assert torch.equal(live.cpu(), torch.arange(1 << 20, dtype=torch.int32))
    del rest, got
