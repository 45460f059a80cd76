"""Network presets shipped with exoframe, one YAML file each (installed as exoframe.netmodels)."""
