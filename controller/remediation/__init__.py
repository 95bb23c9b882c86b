"""Remediation: from the controller's findings to actions (`policy`, pure) and out (`publish`)."""
