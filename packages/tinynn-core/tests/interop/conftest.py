"""The interop tests: tinynn against transformers and torch (CPU wheels), and a corpus larger than the memory a
run may use. They need packages the core suite does not install, so they run only with TINYNN_INTEROP=1
(nox's interop session sets it); elsewhere this folder is not collected."""
import os

if os.environ.get("TINYNN_INTEROP") != "1":
    collect_ignore_glob = ["test_*.py"]
