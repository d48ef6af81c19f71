import jax, jax.numpy as jnp
def big(x):
    for i in range(300):
        x = jnp.sin(x @ x.T) + i
    return x.sum()
print("compiling", flush=True)
jax.jit(big)(jnp.ones((64, 64)))
print("done", flush=True)
