"""CONT / CPY of same-shaped strided views (the path that transposes V for attention)."""
import numpy as np
import pytest

import ggml_py as gg


@pytest.mark.kernels
@pytest.mark.parametrize("src_type, dst_type", [(gg.F16, gg.F16), (gg.F32, gg.F32),
                                                (gg.F32, gg.F16), (gg.F16, gg.F32)])
@pytest.mark.parametrize("axes", [(0, 2, 1), (2, 0, 1), (1, 0, 2)])
def test_copy_of_permuted_view(src_type, dst_type, axes):
    rng = np.random.default_rng(0)
    data = rng.standard_normal((3, 5, 7)).astype(np.float32)
    ctx = gg.Context(mem_size=1 << 20)
    a = ctx.from_numpy(data, type=src_type)
    p = gg.permute(a, axes)
    dst = ctx.new_tensor(dst_type, p.shape)
    y = gg.cont(p) if src_type == dst_type else gg.cpy(p, dst)
    gg.build_forward(y).compute(n_threads=2)
    expected = np.transpose(a.numpy().astype(np.float32), axes)
    np.testing.assert_allclose(y.numpy().astype(np.float32), expected,
                               rtol=1e-3 if gg.F16 in (src_type, dst_type) else 0)
    assert y.is_contiguous
