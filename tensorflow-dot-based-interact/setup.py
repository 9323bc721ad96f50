"""Wheel of the DotBasedInteract op: the Python wrapper plus the compiled library."""
from setuptools import Distribution, find_packages, setup


class BinaryDistribution(Distribution):
    """Marks the wheel platform-specific: it ships a compiled .so."""

    def has_ext_modules(self) -> bool:
        return True


setup(
    name="tensorflow-dot-based-interact",
    version="0.0.1",
    description="DLRM dot-interaction TensorFlow op with CPU and CUDA kernels",
    packages=find_packages(include=["tensorflow_dot_based_interact"]),
    package_data={"tensorflow_dot_based_interact": ["*.so", "*.json"]},
    include_package_data=True,
    # The library is built against one TensorFlow release (tensorflow or tensorflow-cpu, which
    # install under different names), so TensorFlow is not declared as a dependency here.
    python_requires=">=3.9",
    distclass=BinaryDistribution,
    zip_safe=False,
)
