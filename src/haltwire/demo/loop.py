"""Placeholder replaced below."""


def main(argv: list[str]) -> int:
    raise NotImplementedError
