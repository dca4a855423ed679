"""Running the stack: the service table and the ``concierge`` command line."""

from stack.services import SERVICES, ServiceSpec, UnknownServiceError, get_service

__all__ = ["SERVICES", "ServiceSpec", "UnknownServiceError", "get_service"]
