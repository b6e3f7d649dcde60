# SPDX-License-Identifier: Apache-2.0
"""STAND-IN for ray.experimental in tests (see ../../README.md): records registrations only."""
REGISTERED = {}


def register_tensor_transport(name, devices, transport_manager_class, data_type):
    if name in REGISTERED:
        raise ValueError("tensor transport %s is already registered" % name)
    REGISTERED[name] = (list(devices), transport_manager_class, data_type)
