"""Where the session store keeps its data: the seam (``base``), a local directory
(``directory``), Redis (``redis``) and a private Redis server for tests and local use
(``redis_server``).

Invariants:
1. Importing the package loads no backend (enforced: this file holds no import), so the directory
   backend never loads the Redis client.
2. It is a regular package (this file), so setuptools' package discovery ships it in a wheel
   (checked: ``tests/test_packaging.py``).
"""
