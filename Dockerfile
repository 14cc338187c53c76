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
COPY cli ./cli
COPY bench ./bench
RUN pip install --no-cache-dir ".[s3]"
EXPOSE 6066
CMD ["causeway", "worker"]
