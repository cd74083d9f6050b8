"""The package's version (also the version its OpenTelemetry tracer reports)."""

__version__ = "0.1.0"
