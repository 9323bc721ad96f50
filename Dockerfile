# GPU training image. NGC's TensorFlow 24.02 container ships Python 3.10, CUDA 12.3, g++ 11,
# TensorFlow 2.15 and Horovod 0.28.1 built against it with NCCL, MPI and Gloo: none of these is
# reinstalled here. Override BASE only with a tag that still ships TF 2.15 (Horovod 0.28.1 does
# not run on TF >= 2.16).
#   docker build -t dlrm-tf2 .
#   docker run --gpus all --ipc=host --rm -it -v /data/dlrm:/data/dlrm dlrm-tf2
# README.md ("GPUs") has the launch lines and how to run the tests in this image.
ARG BASE=nvcr.io/nvidia/tensorflow:24.02-tf2-py3
FROM ${BASE}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV HOROVOD_CYCLE_TIME=0.2 \
    HOROVOD_ENABLE_ASYNC_COMPLETION=1 \
    TF_CPP_MIN_LOG_LEVEL=1

WORKDIR /dlrm

# The runtime pins (requirements.txt) minus what the base has: never TensorFlow (tensorflow-cpu
# is the CPU hosts' build) or numpy, nor any other package the base already ships; PySpark
# belongs to the preprocessing images. Every package of the base is also a constraint, so no
# dependency can replace NGC's TensorFlow, numpy or Horovod (pip stops with a conflict instead).
COPY requirements.txt requirements-dev.txt ./
RUN pip list --format=freeze > /tmp/base-constraints.txt \
 && cut -d= -f1 /tmp/base-constraints.txt | tr 'A-Z_.' 'a-z--' > /tmp/base-names.txt \
 && grep -E '^[A-Za-z0-9]' requirements.txt | grep -vE '^(tensorflow-cpu|numpy|pyspark)==' \
    | while IFS= read -r pin; do \
        grep -qx "$(echo "${pin%%==*}" | tr 'A-Z_.' 'a-z--')" /tmp/base-names.txt || echo "${pin}"; \
      done > /tmp/image-requirements.txt \
 && echo "installing over the base: $(tr '\n' ' ' < /tmp/image-requirements.txt)" \
 && if [ -s /tmp/image-requirements.txt ]; then \
      pip install --no-cache-dir -c /tmp/base-constraints.txt -r /tmp/image-requirements.txt; \
    fi \
 && rm /tmp/base-constraints.txt /tmp/base-names.txt /tmp/image-requirements.txt

COPY . .

# The dot-interaction op with CUDA kernels for each of sm_70..sm_90 that the image's nvcc builds,
# plus PTX of the newest; the list is recorded beside the library for --dot_interaction auto.
RUN make -C tensorflow-dot-based-interact gpu PYTHON=python \
 && python -c "import horovod, numpy, tensorflow as tf, horovod.tensorflow as hvd; print('tensorflow', tf.__version__, 'numpy', numpy.__version__, 'horovod', horovod.__version__, 'nccl', bool(hvd.nccl_built()))" \
 && cat tensorflow-dot-based-interact/tensorflow_dot_based_interact/_dot_based_interact_ops.json
