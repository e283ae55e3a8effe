"""What runs inside the training container: FSDP2 training, NVRx integration, control-plane reporter.

Imports nothing from api/ or workers/: the only contract with the control plane is HTTP.
"""
