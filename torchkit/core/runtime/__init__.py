"""The runtime floor: devices, processes (distributed), seeds, memory and optional extras."""
