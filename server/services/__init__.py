"""Services: the server's logic, between thin routes and the repositories; they raise ``ServiceError``."""
