"""The rules every handler checks a request by: argument checks and the queue policy."""
