"""Who may use the server: the configured tokens (``tokens``), the web pages' server-side sessions
(``sessions``) and the brake on guessing tokens (``throttle``). The REST dependency (``api/deps.py``) and the
pages' sign-in (``web/auth.py``) both use these, so a token is checked the same way on either path."""
