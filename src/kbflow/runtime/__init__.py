"""The process a run lives in: environment defaults and offline mode (``environment``), the cores a run may use
(``cores``), memory arenas and trimming (``memory``), progress events (``progress``) and the failure points tests
crash a run at (``failpoints``). Imports only ``kbflow.core``."""
