# The example app (example_app/) on ratelimit_mw; docker-compose.yml runs it on Redis.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app

COPY pyproject.toml README.md ./
COPY ratelimit_mw ./ratelimit_mw
RUN pip install --no-cache-dir '.[fastapi]' 'uvicorn>=0.30'

COPY example_app ./example_app
RUN useradd --create-home app
USER app

EXPOSE 8000
CMD ["uvicorn", "example_app.main:app", "--lifespan", "on", "--no-proxy-headers", "--host", "0.0.0.0", "--port", "8000"]
