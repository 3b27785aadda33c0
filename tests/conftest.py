pytest_plugins = ["tests.lab.fixtures", "tests.operator_fixtures"]
