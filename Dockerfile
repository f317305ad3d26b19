# One image for the Gangway service and the Ray nodes: ranks import the same `workers`
# package the service submits, so both must run the same code. bubblewrap (and util-linux's
# setpriv) sandbox every rank program on a node (workers/supervisor/sandbox.py).
#   docker build -t gangway:latest .                                   (CPU torch)
#   docker build -t gangway:gpu --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
FROM python:3.11-slim

# Which torch build: the CPU wheel keeps the image small; GPU nodes need a CUDA build.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /opt/gangway
COPY pyproject.toml README.md ./
COPY gangway ./gangway
COPY api ./api
COPY scheduler ./scheduler
COPY workers ./workers
COPY migrations ./migrations
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap util-linux \
    && rm -rf /var/lib/apt/lists/* \
    && pip install --index-url "${TORCH_INDEX_URL}" torch==2.13.0 \
    && pip install . \
    && useradd --create-home --uid 1000 gangway \
    && mkdir -p /data && chown gangway /data
USER gangway

# Secure by default: API keys required; the bootstrap admin key comes from
# GANGWAY_ADMIN_KEY at run time (never baked into the image).
ENV GANGWAY_AUTH=true GANGWAY_DATA_DIR=/data
EXPOSE 8000
CMD ["gangway", "serve", "--host", "0.0.0.0", "--port", "8000"]
