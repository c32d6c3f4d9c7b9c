"""fedproto's protocol families and their shared building blocks.

Importing this package turns on JAX's 64-bit mode: FastLloyd's fixed-point encoding needs 2^-16
resolution on aggregates of magnitude up to 2^15, which float32's 24-bit significand cannot hold
(spec fastlloyd.md, section 6), and relative sums of tens of thousands of points need float64 too.
Kernels state their dtypes explicitly, so code that passes float32 arrays still gets float32.
"""

import jax

jax.config.update("jax_enable_x64", True)
