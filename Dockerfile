# One image for the Gangway service and the Ray nodes: ranks import the same `workers`
# package the service submits, so both must run the same code.
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /opt/gangway
COPY pyproject.toml README.md ./
COPY gangway ./gangway
COPY api ./api
COPY scheduler ./scheduler
COPY workers ./workers
COPY migrations ./migrations
# The CPU wheel keeps the image small; a GPU image installs torch's CUDA build instead.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
    && pip install .

EXPOSE 8000
CMD ["gangway", "serve", "--host", "0.0.0.0", "--port", "8000"]
