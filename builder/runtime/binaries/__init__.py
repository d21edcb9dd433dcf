"""Reading shared objects as the dynamic loader does: ELF files and the loader's search rules."""
