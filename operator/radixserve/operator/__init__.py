"""kopf operator reconciling the InferenceService CRD; imports no torch."""
