"""Running the stack: the service table and the ``concierge`` command line."""

from infra.stack.services import SERVICES, ServiceSpec, UnknownServiceError, get_service

__all__ = ["SERVICES", "ServiceSpec", "UnknownServiceError", "get_service"]
