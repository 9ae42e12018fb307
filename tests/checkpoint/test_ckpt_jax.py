"""JAX arrays round-trip with dtype, shape and device (runs where JAX is installed)."""

from __future__ import annotations

import numpy as np
import pytest

from segue.checkpoint import LocalStorage, load, save

jax = pytest.importorskip("jax", reason="jax is not installed; `pip install jax` to run these tests")
jnp = pytest.importorskip("jax.numpy")


def test_jax_arrays_round_trip(tmp_path) -> None:
    state = {
        "w": jnp.arange(12, dtype=jnp.float32).reshape(3, 4),
        "b": jnp.ones((5,), dtype=jnp.bfloat16),
        "i": jnp.array([1, 2, 3], dtype=jnp.int32),
        "key": jax.random.key_data(jax.random.PRNGKey(7)),
    }
    storage = LocalStorage(tmp_path)
    save(storage, "c/1", state)
    back = load(storage, "c/1").state
    for k, v in state.items():
        assert isinstance(back[k], jax.Array)
        assert back[k].dtype == v.dtype and back[k].shape == v.shape
        np.testing.assert_array_equal(np.asarray(back[k]), np.asarray(v))
        assert {str(d) for d in back[k].devices()} == {str(d) for d in v.devices()}
