"""The simulated Jetson AGX Orin ("sim-orin" twin): step traces, device parameters, physics."""
