import time, jax, jax.numpy as jnp, numpy as np
cap = 1_100_000
rng = np.random.default_rng(0)
idx = jnp.asarray(rng.integers(0, cap, (32, 32, 4)).astype(np.int32))
for name, shape, dt in [("u32x1792", (cap, 1792), jnp.uint32), ("u32x14x128", (cap, 14, 128), jnp.uint32), ("u32x1764", (cap, 1764), jnp.uint32), ("u8x7168", (cap, 7168), jnp.uint8)]:
    store = jnp.zeros(shape, dt)
    for mode in ("take", "getitem"):
        f = jax.jit((lambda s, i: jnp.take(s, i, axis=0, mode="clip")) if mode == "take" else (lambda s, i: s[i]))
        c = f.lower(store, idx).compile()
        out = f(store, idx); out.block_until_ready()
        t = time.perf_counter()
        for _ in range(50): out = f(store, idx)
        out.block_until_ready()
        print(name, mode, "temp GB", c.memory_analysis().temp_size_in_bytes / 1e9, "ms", (time.perf_counter() - t) / 50 * 1e3, flush=True)
    del store
