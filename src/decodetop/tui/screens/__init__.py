"""Provides the live UI's modal screens: help, probe and check details, the model picker."""
