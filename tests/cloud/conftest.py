"""The cloud tier: what only AWS runs (S3, ECR, CreateTrainingJob), against moto in server mode (tests/conftest.py:
moto_endpoint, aws)."""
