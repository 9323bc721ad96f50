# GPU training image. The NGC TensorFlow 24.02 container ships TensorFlow 2.15 with Horovod
# (NCCL, MPI, Gloo) already built against it, so nothing heavy is rebuilt here. Override BASE to
# move to another tag that still ships TF 2.15 (Horovod 0.28.1 does not run on TF >= 2.16).
ARG BASE=nvcr.io/nvidia/tensorflow:24.02-tf2-py3
FROM ${BASE}

ENV HOROVOD_CYCLE_TIME=0.2 \
    HOROVOD_ENABLE_ASYNC_COMPLETION=1 \
    TF_CPP_MIN_LOG_LEVEL=1

WORKDIR /dlrm

# The container's TensorFlow and Horovod are kept; install only the remaining pins that do not
# replace them (tensorflow-cpu and pyspark are for CPU hosts and preprocessing, not this image).
COPY requirements.txt .
RUN grep -vE '^(tensorflow-cpu|pyspark|numpy)==' requirements.txt > /tmp/requirements-gpu.txt \
 && pip install --no-cache-dir -r /tmp/requirements-gpu.txt \
 && rm /tmp/requirements-gpu.txt

COPY . .

# Build the custom dot-interaction op with its CUDA kernels (make picks GPU when nvcc is present).
RUN make -C tensorflow-dot-based-interact PYTHON=python \
 && python -c "import horovod.tensorflow as hvd; print('horovod', hvd.__version__)"
