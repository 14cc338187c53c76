"""The write path: Nessie REST v2 client, Iceberg catalog on Nessie, batched atomic OCC commits."""
