"""Errors in OpenAI's schema: {"error": {"message", "type", "param", "code"}} with a status."""


class APIError(Exception):
    """A request the server answers with an error: the HTTP status and OpenAI's error
    fields (type: invalid_request_error, authentication_error, not_found_error,
    unavailable_error, server_error; param: the request field at fault)."""

    def __init__(self, status, message, type="invalid_request_error", param=None, code=None):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code = param, code

    def body(self):
        """The JSON body, as OpenAI's API writes it."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad_request(message, param=None, code=None):
    """A 400 invalid_request_error."""
    return APIError(400, message, param=param, code=code)


def loading():
    """503 while the model loads (llama.cpp's answer)."""
    return APIError(503, "Loading model", type="unavailable_error", code=503)


def overloaded(capacity):
    """503 when the bounded queue is full."""
    return APIError(503, f"the server is busy: {capacity} sequences are running or waiting "
                         f"already; try again later", type="unavailable_error",
                    code="server_overloaded")
