"""Report renderers: JSON, JUnit XML, HTML."""
