"""The data plane: what each ingress replica does for a request without asking an actor."""
