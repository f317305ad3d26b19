"""Attacks through the public interface (HTTP requests to the app, the CLI against a
service), one file per protection; each test failed on the code before its fix."""
