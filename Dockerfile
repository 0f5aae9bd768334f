# The example app (example_app/) on ratelimit_mw; docker-compose.yml runs it on Redis.
FROM python:3.11-slim

# PROMETHEUS_MULTIPROC_DIR: the workers' metrics files, summed by GET /metrics (empty in
# every new container; docker-compose.yml mounts a tmpfs there).
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PROMETHEUS_MULTIPROC_DIR=/tmp/ratelimit-metrics \
    PATH=/app/.venv/bin:$PATH
WORKDIR /app

# Exactly uv.lock's versions: the package with its [fastapi,prometheus] extras, uvicorn
# (the example group) and the build backend that installs the package.
COPY pyproject.toml uv.lock README.md ./
COPY ratelimit_mw ./ratelimit_mw
RUN pip install --no-cache-dir "uv==0.13.9" \
    && uv sync --locked --no-cache --no-editable --no-default-groups --group backend \
       --group example --extra fastapi --extra prometheus

COPY example_app ./example_app
RUN useradd --create-home app && mkdir -p /tmp/ratelimit-metrics \
    && chown app /tmp/ratelimit-metrics
USER app

EXPOSE 8000
CMD ["uvicorn", "example_app.main:app", "--lifespan", "on", "--no-proxy-headers", "--host", "0.0.0.0", "--port", "8000"]
