"""Fakes that mimic real hardware interfaces exactly: Jetson sysfs trees and the pynvml module."""
