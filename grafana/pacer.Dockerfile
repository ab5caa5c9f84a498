# The skewtrace pacer (`skewtrace pacer`) for grafana/docker-compose.yaml. It needs the package
# without torch: the pacer only reads OTLP metrics and serves HTTP.
#
#   docker build -f grafana/pacer.Dockerfile -t skewtrace/pacer:local .    (from the repo root)
FROM python:3.11-slim

WORKDIR /src
COPY pyproject.toml README.md ./
COPY src/skewtrace ./src/skewtrace
RUN pip install --no-cache-dir . && rm -rf /src

# Inside the container it must listen on all interfaces; compose decides what the host exposes.
ENV SKEWTRACE_PACER_OTLP_GRPC=0.0.0.0:4321 \
    SKEWTRACE_PACER_HTTP=0.0.0.0:4320
EXPOSE 4320 4321
USER 65534:65534
ENTRYPOINT ["skewtrace"]
CMD ["pacer"]
