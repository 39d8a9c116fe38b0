"""params.yaml as typed sections (`config`), its bounds (`limits`, `sizes`), and profiles as
overlays written out as a whole params file (`profiles`, `file`)."""
