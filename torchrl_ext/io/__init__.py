"""Files: component state in safetensors + JSON (more formats come with the velora issue)."""
from torchrl_ext.io.state_files import atomic_write, load_state, save_state

__all__ = ["atomic_write", "load_state", "save_state"]
