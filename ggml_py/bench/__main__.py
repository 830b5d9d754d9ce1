import sys

from ggml_py.bench import main

sys.exit(main())
