"""Third-party test fixtures: verl's GSM8K tool and interaction (volcengine/verl, Apache-2.0) and
their YAML configs, copied with only their import lines changed (the YAMLs: only `class_name`),
so tests/test_verl_gsm8k.py can show a verl user's files running here as they are."""
