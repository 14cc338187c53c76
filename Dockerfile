# The causeway worker image used by docker-compose.yml.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY streams ./streams
COPY agents ./agents
COPY models ./models
COPY sinks ./sinks
COPY monitoring ./monitoring
COPY worlds ./worlds
COPY ops ./ops
COPY cdc ./cdc
COPY api ./api
COPY cli ./cli
# pyarrow (a dependency) serves s3:// warehouses; no extra S3 client is needed.
RUN pip install --no-cache-dir .
EXPOSE 6066
CMD ["causeway", "worker"]
