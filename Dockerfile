# An image for fiberexec's Docker and Kubernetes workers.
#
#   docker build -t me/app:1 .
#   FiberExecutor(backend="docker", image="me/app:1")   # or backend="kubernetes"
#
# It holds Python, fiberexec and its dependencies, and runs `python -m fiberexec.worker`, which
# reads its address and secret from FIBEREXEC_* environment variables set by the backend. Add
# the packages your tasks import (and your code, unless the Docker backend bind-mounts the
# working directory, which it does by default) in a layer of your own:
#
#   FROM me/fiberexec:latest
#   RUN pip install numpy scikit-learn
#
# Workers need the same Python minor version and compatible package versions as the program
# that submits tasks, because functions and arguments travel as pickles.
# (The test suite builds its own image with scripts/build-test-image.sh, without a registry.)
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/fiberexec
# Dependencies first, so editing the source rebuilds only the last layers.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
COPY README.md ./
COPY backends/ backends/
COPY fiberexec/ fiberexec/
RUN pip install --no-deps . && rm -rf /opt/fiberexec

WORKDIR /
CMD ["python", "-m", "fiberexec.worker"]
