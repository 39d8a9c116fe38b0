"""Kubeflow: the pipeline built from the same stage scripts as dvc.yaml (python -m pipeline --help)."""
