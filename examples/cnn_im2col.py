"""One training step of a small CNN whose convolutions are jax_tma.im2col
followed by a matmul, checked against the same network written with
lax.conv_general_dilated.

    pip install . && python examples/cnn_im2col.py

Runs on a CPU-only machine (the CPU handlers) and on a GPU (im2col through
the TMA im2col mode where its rules hold; the gradient is jax_tma.col2im).
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_tma

HI = lax.Precision.HIGHEST
DIMS = ("NHWC", "HWIO", "NHWC")


def conv_im2col(x, w, stride):
    """A SAME convolution as patches @ weights (HWIO weights, tap-major)."""
    kh, kw, cin, cout = w.shape
    patches = jax_tma.im2col(x, (kh, kw), strides=stride, padding="SAME")
    return jnp.matmul(patches, w.reshape(kh * kw * cin, cout), precision=HI)


def conv_xla(x, w, stride):
    return lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=DIMS,
                                    precision=HI)


def init(key):
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "c1": jax.random.normal(k1, (3, 3, 4, 16)) * 0.3,
        "c2": jax.random.normal(k2, (3, 3, 16, 32)) * 0.1,
        "fc": jax.random.normal(k3, (32, 10)) * 0.1,
    }


def loss_fn(params, x, labels, conv):
    h = jax.nn.relu(conv(x, params["c1"], 1))
    h = jax.nn.relu(conv(h, params["c2"], 2))
    logits = jnp.matmul(h.mean(axis=(1, 2)), params["fc"], precision=HI)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))


def sgd_step(params, x, labels, conv, lr=0.1):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, labels, conv)
    return loss, jax.tree.map(lambda p, g: p - lr * g, params, grads)


key = jax.random.key(0)
params = init(key)
x = jax.random.normal(jax.random.fold_in(key, 1), (8, 16, 16, 4))
labels = jax.random.randint(jax.random.fold_in(key, 2), (8,), 0, 10)

step_tma = jax.jit(lambda p, x, y: sgd_step(p, x, y, conv_im2col))
step_xla = jax.jit(lambda p, x, y: sgd_step(p, x, y, conv_xla))
loss_tma, new_tma = step_tma(params, x, labels)
loss_xla, new_xla = step_xla(params, x, labels)
print(f"loss: im2col + matmul {float(loss_tma):.6f}, lax.conv_general_dilated "
      f"{float(loss_xla):.6f}")
np.testing.assert_allclose(loss_tma, loss_xla, rtol=1e-5)
for name in params:
    np.testing.assert_allclose(new_tma[name], new_xla[name], rtol=1e-4, atol=1e-5)
    print(f"updated {name}: max |difference| "
          f"{float(jnp.abs(new_tma[name] - new_xla[name]).max()):.2e}")
print("one SGD step through jax_tma.im2col / col2im matches lax.conv_general_dilated")
