"""Small leaves every floor may import downward: config errors, exit codes, the signal mask held at
start, the API token, secret redaction and the bounded tool runner. They import nothing of the
project, so nothing here can start a circle."""
