FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY zerda_store ./zerda_store
COPY migrations ./migrations
RUN pip install --no-cache-dir ".[postgres]"
CMD ["zerda-store", "--help"]
