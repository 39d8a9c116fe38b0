"""The run report: zero-shot vs final, training curves and plots (`build.build_report`)."""
